"""Python client of the tb Redis module: a fleet-wide token bucket.

    import redis
    from tb_limiter import Limiter

    limiter = Limiter(redis.Redis.from_url("redis://127.0.0.1:6379/0"))
    llm = limiter.bucket("llm:openai", rate="0.5", capacity=1)
    r = llm.consume()            # Result(allowed, remaining, retry_after_ms, ...)
    llm.acquire(timeout=30)      # reserves, then sleeps on the client

Uses the module when the server has it and a Lua script with the same
replies otherwise. ``Limiter.from_url(url)`` makes its client lazily per
process (fork-safe).
"""

from ._protocol import SCRIPT, Call
from ._rates import LimitSpec, parse_limits
from ._spec import BucketSpec
from ._types import Backend, BucketInfo, FlowInfo, MultiResult, NotSent, RateLimited, Result
from .batch import AsyncBatcher, Batcher
from .aio import AsyncBucketGroup, AsyncLeased, AsyncLeasedMany, AsyncLimit, AsyncLimiter, AsyncTokenBucket
from .sync import BucketGroup, Leased, LeasedMany, Limit, Limiter, TokenBucket

__all__ = [
    "AsyncBatcher",
    "AsyncBucketGroup",
    "AsyncLeased",
    "AsyncLeasedMany",
    "AsyncLimit",
    "AsyncLimiter",
    "AsyncTokenBucket",
    "Backend",
    "Batcher",
    "BucketGroup",
    "BucketInfo",
    "BucketSpec",
    "Call",
    "FlowInfo",
    "Leased",
    "LeasedMany",
    "Limit",
    "LimitSpec",
    "Limiter",
    "MultiResult",
    "NotSent",
    "RateLimited",
    "Result",
    "SCRIPT",
    "TokenBucket",
    "parse_limits",
]
