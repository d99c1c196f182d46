package etcdlock

// Internals exported to the black-box tests.

// SetProtocol turns the protocol switches watchAhead and reuseRenewal on
// or off (for benchmarks that measure what they save) and returns a
// function restoring them. Not safe while acquisitions run.
func SetProtocol(ahead, reuse bool) (restore func()) {
	a, r := watchAhead.Load(), reuseRenewal.Load()
	watchAhead.Store(ahead)
	reuseRenewal.Store(reuse)
	return func() {
		watchAhead.Store(a)
		reuseRenewal.Store(r)
	}
}
