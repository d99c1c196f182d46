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

// WriterClaims reports, for tests, how many writers' claims b keeps a
// record of (to withdraw them).
func WriterClaims(b *Backend) int {
	n := 0
	b.writers.Range(func(any, any) bool { n++; return true })
	return n
}
