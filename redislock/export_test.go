package redislock

// Batched reports, for tests, how many of b's script calls are in flight
// on their own or as a batch's sender, and how many wait to be batched.
func Batched(b *Backend) (inflight, waiting int) {
	if b.batch == nil {
		return 0, 0
	}
	b.batch.mu.Lock()
	defer b.batch.mu.Unlock()
	return b.batch.inflight, len(b.batch.pending)
}
