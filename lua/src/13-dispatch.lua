local COMMANDS = {
  ['TB.CONSUME'] = cmd_consume,
  ['TB.MCONSUME'] = cmd_mconsume,
  ['TB.REFUND'] = cmd_refund,
  ['TB.RELEASE'] = cmd_release,
  ['TB.INFO'] = cmd_info,
}

local first = 1
if (ARGV[1] or ''):upper() == 'LEASE-SEED' then
  local seed = parse_int(ARGV[2] or '', MAX_LEASE_ID_STR, ERR_LEASE_SEED)
  if not seed or seed == 0 then return err(ERR_LEASE_SEED) end
  lease_seed = seed
  first = 3
end
local handler = COMMANDS[(ARGV[first] or ''):upper()]
if not handler then
  return err('ERR tb.lua: the first argument must be TB.CONSUME, TB.MCONSUME, TB.REFUND, TB.RELEASE or TB.INFO')
end
local args = {}
for i = first + 1, #ARGV do args[i - first] = ARGV[i] end
return handler(args)
