-- A collect script for prometheus-redis-exporter (Debian's 1.45 and later):
-- it turns the module's INFO section into metrics.
--
--   prometheus-redis-exporter -script /opt/tb/tb-metrics.lua ...
--
-- The exporter runs it with EVAL on every scrape and exports each returned
-- pair as a gauge: redis_script_values{key="tb_calls"} 42. Every field of
-- INFO tb is an integer (docs/operations/metrics.md lists them); counters only grow,
-- until TB.CONFIG RESETSTAT or a restart, so use rate()/increase() on them.
-- The wait histogram's last bucket, tb_wait_ms_le_inf, is returned as
-- tb_wait_ms_le_+Inf so that label_replace() can turn the keys into the le
-- labels histogram_quantile() needs.
--
-- The exporter's user needs +eval and +info (docs/operations/metrics.md, "Prometheus").

local info = redis.call('INFO', 'tb')
local result = {}
for name, value in string.gmatch(info, '(tb_[%w_]+):([^\r\n]*)') do
  -- The exporter gives up on the whole script at the first value that is
  -- not a number: skip any such field instead.
  if tonumber(value) ~= nil then
    if name == 'tb_wait_ms_le_inf' then
      name = 'tb_wait_ms_le_+Inf'
    end
    table.insert(result, name)
    table.insert(result, value)
  end
end
return result
