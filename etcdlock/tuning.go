package etcdlock

import "time"

// tuning is a Backend's protocol switches and timings. New sets the
// production values below; the tests and the hand-off benchmark change
// them on a Backend before its first use (export_test.go) to measure what
// each saves. Read-only once the Backend is in use.
type tuning struct {
	// watchAhead: a waiter third or further in line also watches the
	// entry before its predecessor (see awaitDelete).
	watchAhead bool
	// reuseRenewal: a grant shortly after a renewal of its lease counts
	// from that renewal instead of renewing again (see renewedAt and
	// lifeFrom).
	reuseRenewal bool
	// anchorStream: the Backend keeps its waiters' watch stream open
	// between waits (see anchorLoop).
	anchorStream bool
	// shareWatches: the Backend's waiters share their entry watches and
	// keep them open a while (see entrywatch.go).
	shareWatches bool

	// lossWatchDelay is how long after a grant the deletion watch of the
	// lock starts, from the grant's revision (see addHold).
	lossWatchDelay time.Duration
	// entryWatchLinger is how long an entry watch no waiter uses stays
	// open (see entrywatch.go).
	entryWatchLinger time.Duration
	// prefixWatchMin is the number of held locks from which the Backend
	// watches its prefix instead of each lock (see prefixwatch.go).
	prefixWatchMin int
}

// defaultTuning is the production tuning.
func defaultTuning() tuning {
	return tuning{
		watchAhead:       true,
		reuseRenewal:     true,
		anchorStream:     true,
		shareWatches:     true,
		lossWatchDelay:   50 * time.Millisecond,
		entryWatchLinger: time.Second,
		prefixWatchMin:   64,
	}
}
