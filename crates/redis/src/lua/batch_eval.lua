-- The batch script (EVALSHA): one request's keys decided by `batch` (batch.lua).
return batch()
