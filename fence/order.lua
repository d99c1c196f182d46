-- order.lua: package fence's rule, shared by set.lua and claim.lua (each
-- runs as this file followed by its own).

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
