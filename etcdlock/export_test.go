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
