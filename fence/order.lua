-- order.lua: package fence's rule, shared by set.lua and claim.lua (each
-- runs as this file followed by its own).
--
-- accepts reports whether the token (fence, owner, epoch) may use a value
-- whose highest accepted token has fence hf, owner ho and epoch he (as
-- HMGET returns them: false when absent; no epoch is epoch 0): when
-- (epoch, fence) > (he, hf), or == from the same owner. tonumber is exact
-- up to 2^53, far above the fences dlock issues (server TIME in µs is
-- about 2^51 in 2026) and the epochs used.
local function accepts(fence, owner, epoch, hf, ho, he)
  local highest, hepoch = tonumber(hf or '0'), tonumber(he or '0')
  fence, epoch = tonumber(fence), tonumber(epoch)
  if epoch ~= hepoch then
    return epoch > hepoch
  end
  if fence ~= highest then
    return fence > highest
  end
  return not hf or ho == owner
end
