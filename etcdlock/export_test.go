package etcdlock

import "time"

// Internals exported to the black-box tests.

// Protocol is the set of protocol switches, all on in production; the
// hand-off benchmark turns some off to measure what they save.
type Protocol struct {
	WatchAhead   bool // watchAhead
	ReuseRenewal bool // reuseRenewal
	AnchorStream bool // anchorStream
	ShareWatches bool // shareWatches
}

// AllOn is the production protocol.
var AllOn = Protocol{WatchAhead: true, ReuseRenewal: true, AnchorStream: true, ShareWatches: true}

// SetProtocol sets the protocol switches and returns a function restoring
// them. Not safe while acquisitions run.
func SetProtocol(p Protocol) (restore func()) {
	old := Protocol{watchAhead.Load(), reuseRenewal.Load(), anchorStream.Load(), shareWatches.Load()}
	set := func(p Protocol) {
		watchAhead.Store(p.WatchAhead)
		reuseRenewal.Store(p.ReuseRenewal)
		anchorStream.Store(p.AnchorStream)
		shareWatches.Store(p.ShareWatches)
	}
	set(p)
	return func() { set(old) }
}

// SetEntryWatchLinger sets how long an entry watch no waiter uses stays
// open and returns a function restoring it.
func SetEntryWatchLinger(d time.Duration) (restore func()) {
	old := entryWatchLinger.Swap(int64(d))
	return func() { entryWatchLinger.Store(old) }
}

// PrefixWatchMin returns the number of held locks from which a Backend
// watches its whole prefix instead of each lock.
func PrefixWatchMin() int { return int(prefixWatchMin.Load()) }

// SetPrefixWatchMin sets that number and returns a function restoring it.
// Not safe while locks are held.
func SetPrefixWatchMin(n int) (restore func()) {
	old := prefixWatchMin.Swap(int64(n))
	return func() { prefixWatchMin.Store(old) }
}

// WatchState reports whether b watches its whole prefix for deletions,
// and how many of its held locks have a deletion watch of their own
// (running, or due to start); running counts those started.
func WatchState(b *Backend) (prefix bool, own, running int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, h := range b.held {
		if h.own != nil {
			own++
			if h.own.cancel != nil {
				running++
			}
		}
	}
	return b.pw != nil, own, running
}

// EndPrefixWatch ends b's prefix watch as if the server had cancelled it
// (b reads its held locks again and watches anew). It reports whether
// there was one.
func EndPrefixWatch(b *Backend) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pw == nil {
		return false
	}
	b.pw.cancel()
	return true
}

// SetLossWatchDelay sets how long after a grant a held lock's own
// deletion watch starts and returns a function restoring it.
func SetLossWatchDelay(d time.Duration) (restore func()) {
	old := lossWatchDelay.Swap(int64(d))
	return func() { lossWatchDelay.Store(old) }
}
