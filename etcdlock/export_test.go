package etcdlock

import "time"

// Internals exported to the black-box tests. The setters change a
// Backend's tuning; call them after New and before the Backend's first
// use.

// Protocol is the set of protocol switches, all on in production; the
// hand-off benchmark turns some off to measure what they save.
type Protocol struct {
	WatchAhead   bool // tuning.watchAhead
	ReuseRenewal bool // tuning.reuseRenewal
	AnchorStream bool // tuning.anchorStream
	ShareWatches bool // tuning.shareWatches
}

// AllOn is the production protocol.
var AllOn = Protocol{WatchAhead: true, ReuseRenewal: true, AnchorStream: true, ShareWatches: true}

// SetProtocol sets b's protocol switches.
func SetProtocol(b *Backend, p Protocol) {
	b.tune.watchAhead, b.tune.reuseRenewal = p.WatchAhead, p.ReuseRenewal
	b.tune.anchorStream, b.tune.shareWatches = p.AnchorStream, p.ShareWatches
}

// SetEntryWatchLinger sets how long an entry watch no waiter of b uses
// stays open.
func SetEntryWatchLinger(b *Backend, d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tune.entryWatchLinger = d
}

// PrefixWatchMin returns the number of held locks from which a Backend
// watches its whole prefix instead of each lock, by default.
func PrefixWatchMin() int { return defaultTuning().prefixWatchMin }

// SetPrefixWatchMin sets that number for b.
func SetPrefixWatchMin(b *Backend, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tune.prefixWatchMin = n
}

// SetLossWatchDelay sets how long after a grant a lock held through b
// gets its own deletion watch (0: the default). Safe while b is in use.
func SetLossWatchDelay(b *Backend, d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if d == 0 {
		d = defaultTuning().lossWatchDelay
	}
	b.tune.lossWatchDelay = d
}

// WatchState reports whether b watches its whole prefix for deletions,
// and how many of its held locks have a deletion watch of their own
// (running, or due to start); running counts those started.
func WatchState(b *Backend) (prefix bool, own, running int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, h := range b.holds.byName {
		if h.own != nil {
			own++
			if h.own.cancel != nil {
				running++
			}
		}
	}
	return b.holds.pw != nil, own, running
}

// EndPrefixWatch ends b's prefix watch as if the server had cancelled it
// (b reads its held locks again and watches anew). It reports whether
// there was one.
func EndPrefixWatch(b *Backend) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.holds.pw == nil {
		return false
	}
	b.holds.pw.cancel()
	return true
}

// EncodeEntry and DecodeEntry are the entry value's codec.
var (
	EncodeEntry = encodeEntry
	DecodeEntry = decodeEntry
)

// Orphans returns the number of entries b has given up but not yet
// removed from the server; its background sweep runs while there are any.
func Orphans(b *Backend) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.orphans.byName)
}

// SweepsExpired returns how many rounds of b's background sweep ran out
// of time with orphans left (the server did not answer).
func SweepsExpired(b *Backend) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.orphans.expired
}
