-- order.lua: package fence's rule and value shape, shared by set.lua and
-- claim.lua (each runs as this file followed by its own).

-- cmp compares the unsigned decimals a and b (as written by the Go side:
-- no sign, no leading zeros; false or nil is 0) exactly, whatever their
-- size: -1, 0 or 1. Lua numbers are doubles, exact only below 2^53.
local function cmp(a, b)
  a, b = a or '0', b or '0'
  if #a ~= #b then
    return #a < #b and -1 or 1
  end
  if a == b then
    return 0
  end
  return a < b and -1 or 1
end

-- accepts reports whether the token (fence, owner, epoch) may use a value
-- whose highest accepted token has fence hf, owner ho and epoch he (as
-- HMGET returns them: false when absent; no epoch is epoch 0): when
-- (epoch, fence) > (he, hf), or == from the same owner.
local function accepts(fence, owner, epoch, hf, ho, he)
  local c = cmp(epoch, he)
  if c == 0 then
    c = cmp(fence, hf)
  end
  if c ~= 0 then
    return c > 0
  end
  return not hf or ho == owner
end

-- decimal reports whether s is an unsigned decimal as the Go side writes
-- them (no sign, no leading zeros).
local function decimal(s)
  return s == '0' or string.match(s, '^[1-9]%d*$') ~= nil
end

-- load returns the fields v, f, o, e of the value hash key (as HMGET
-- returns them: false when absent), all false when key does not exist; or
-- nil and what key holds when it is not a value of this package: another
-- type, or a hash with other fields, without f or o, or a malformed f or e.
local function load(key)
  local t = redis.call('TYPE', key)['ok']
  if t == 'none' then
    return {false, false, false, false}
  end
  if t ~= 'hash' then
    return nil, t
  end
  local cur = redis.call('HMGET', key, 'v', 'f', 'o', 'e')
  local n = 0
  for i = 1, 4 do
    if cur[i] then
      n = n + 1
    end
  end
  if not cur[2] or not cur[3] or n ~= redis.call('HLEN', key) or not decimal(cur[2])
      or (cur[4] and not decimal(cur[4])) then
    return nil, 'hash of other fields'
  end
  return cur
end

-- admit loads key and applies the rule to the token (fence, owner, epoch):
-- it returns the fields of load when the token is accepted, else nil and
-- the script's reply: {-1, what the key holds} when it is not a value
-- hash, {0, highest fence, its epoch} (decimal strings) when rejected.
local function admit(key, fence, owner, epoch)
  local cur, held = load(key)
  if not cur then
    return nil, {-1, held}
  end
  if not accepts(fence, owner, epoch, cur[2], cur[3], cur[4]) then
    return nil, {0, cur[2] or '0', cur[4] or '0'}
  end
  return cur
end
