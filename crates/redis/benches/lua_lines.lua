-- The Lua of a group call (batch_many) counted bytecode by bytecode, per source line: run by
-- lua_lines.sh, which builds LIBRARY as crates/redis/src/function.rs builds the function library's
-- batch part. Redis is a table here (GET, PSETEX, DEL, TIME), so this counts the Lua alone, not
-- what Redis does for each call; lua_instructions.sh counts that.
--   lua5.1 lua_lines.lua LIBRARY SCENARIO [GROUP] [TOP]
-- SCENARIO: `expired` (every GET finds nothing: the fleet's 10^6/s quota, whose keys live 1 ms)
-- or `live` (1 000/s and a burst of 100 000: what a call writes is there when read again).
local library, scenario = arg[1], arg[2]
local group, top = tonumber(arg[3] or 32), tonumber(arg[4] or 30)
local live = scenario == 'live'
if not live and scenario ~= 'expired' then
  error('SCENARIO is expired or live')
end

local store, commands = {}, {}
redis = {
  call = function(command, key, ms, value)
    commands[command] = (commands[command] or 0) + 1
    if command == 'GET' then
      return live and store[key] or false
    elseif command == 'PSETEX' then
      store[key] = value
      return {ok = 'OK'}
    elseif command == 'DEL' then
      store[key] = nil
      return 1
    elseif command == 'TIME' then
      return {'1765000000', '123456'}
    end
    error('unexpected command ' .. command)
  end,
}

local source = assert(io.open(library)):read('*a')
local call = assert(loadstring(source, 'library'))()

-- The fleet's request (results/fleet, as lua_instructions.sh sends it): three GCRA keys, cost 1,
-- the server's TIME; the client address one of 100 at random.
local params = live and '1,1000,100000000' or '1,1,1000000'
local plan = '0 g1' .. params .. ' g1' .. params .. ' g1' .. params
math.randomseed(7)
local function one_group()
  local keys, args = {}, {}
  for _ = 1, group do
    local client = string.format('%012d', math.random(0, 99))
    keys[#keys + 1] = 'tollgate:edge:per_ip:gcra:10.0.0.' .. client
    keys[#keys + 1] = 'tollgate:edge:per_ip_path:gcra:0800000031302e302e302e' .. client
      .. '0a0000002f6170692f6974656d73'
    keys[#keys + 1] = 'tollgate:edge:global:gcra:'
    args[#args + 1] = '1'
    args[#args + 1] = plan
  end
  return keys, args
end

-- Warm (the library's memos fill on its first calls, as they do in Redis), then count.
for _ = 1, 50 do
  call(one_group())
end
local calls = 20
local groups = {}
for i = 1, calls do
  groups[i] = {one_group()}
end
local by_line, total = {}, 0
commands = {}
debug.sethook(function()
  local info = debug.getinfo(2, 'Sl')
  local line = info and info.source == 'library' and info.currentline or -1
  by_line[line] = (by_line[line] or 0) + 1
  total = total + 1
end, '', 1)
for i = 1, calls do
  call(groups[i][1], groups[i][2])
end
debug.sethook()

local requests = calls * group
print(string.format('%s, a group of %d: %.0f bytecodes per request', scenario, group,
  total / requests))
local names = {}
for name in pairs(commands) do
  names[#names + 1] = name
end
table.sort(names)
for _, name in ipairs(names) do
  print(string.format('  %s per request: %.2f', name, commands[name] / requests))
end
local lines = {}
for text in source:gmatch('([^\n]*)\n') do
  lines[#lines + 1] = text
end
local order = {}
for line in pairs(by_line) do
  order[#order + 1] = line
end
table.sort(order, function(a, b) return by_line[a] > by_line[b] end)
print('bytecodes per request, line of the library (-1: outside it: the table standing in for Redis), text')
for i = 1, math.min(top, #order) do
  local line = order[i]
  print(string.format('%7.1f %5d  %s', by_line[line] / requests, line,
    (lines[line] or ''):gsub('^%s+', ''):sub(1, 90)))
end
