package dlockotel

import (
	"context"
	"errors"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/dlock-go/dlock"
)

// Metric names, as documented in the package comment.
const (
	MetricAcquisitions    = "dlock.acquisitions"
	MetricAcquireDuration = "dlock.acquire.duration"
	MetricHoldDuration    = "dlock.hold.duration"
	MetricRenewals        = "dlock.renewals"
	MetricRenewalFailures = "dlock.renewal.failures"
	MetricLeasesLost      = "dlock.leases.lost"
	MetricLeasesHeld      = "dlock.leases.held"
	MetricWaiters         = "dlock.waiters"
	MetricNodeErrors      = "dlock.node.errors"
)

// Attribute keys on metric points and spans.
const (
	// AttrBackend is the backend name set by WithBackendName.
	AttrBackend = attribute.Key("dlock.backend")
	// AttrOutcome is the outcome of an Acquire (acquired, not_acquired,
	// error) or of a hold (released, lost).
	AttrOutcome = attribute.Key("dlock.outcome")
	// AttrNode is the node (address or name) of a dlock.NodeError.
	AttrNode = attribute.Key("dlock.node")
	// AttrOperation is the operation a node error happened in: acquire,
	// renew or release.
	AttrOperation = attribute.Key("dlock.operation")
	// AttrKey is the lock's key (spans only: keys are unbounded, so never
	// a metric attribute).
	AttrKey = attribute.Key("dlock.key")
	// AttrFence is the lease's fencing token (spans only).
	AttrFence = attribute.Key("dlock.fence")
	// AttrCount is the reentrant hold count of a granted lease (spans only).
	AttrCount = attribute.Key("dlock.count")
	// AttrAttempt is the attempt number on an attempt span event.
	AttrAttempt = attribute.Key("dlock.attempt.number")
	// AttrGranted tells whether an attempt took the lock (span events).
	AttrGranted = attribute.Key("dlock.granted")
	// AttrHolderTTL is the holder's remaining TTL in seconds when an
	// attempt lost to it and the backend knows it (span events).
	AttrHolderTTL = attribute.Key("dlock.holder_ttl")
	// AttrHeld is how long the lease was held, in seconds (release and
	// lost spans).
	AttrHeld = attribute.Key("dlock.held")
	// AttrError is the error message of a failed attempt (span events).
	AttrError = attribute.Key("dlock.error")
)

// Values of AttrOutcome.
const (
	OutcomeAcquired    = "acquired"
	OutcomeNotAcquired = "not_acquired"
	OutcomeError       = "error"
	OutcomeReleased    = "released"
	OutcomeLost        = "lost"
)

// Explicit bucket boundaries (seconds), advisory: a View may override them.
var (
	acquireBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
	holdBuckets    = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600}
)

const (
	outAcquired = iota
	outNotAcquired
	outError
	nOutcomes
)

// attrOpts holds the precomputed option slices for one attribute set, so
// that Add and Record get a ready slice and allocate nothing.
type attrOpts struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

func newAttrOpts(kvs ...attribute.KeyValue) attrOpts {
	o := metric.WithAttributeSet(attribute.NewSet(kvs...))
	return attrOpts{add: []metric.AddOption{o}, rec: []metric.RecordOption{o}}
}

type meters struct {
	acquisitions    metric.Int64Counter
	acquireDuration metric.Float64Histogram
	holdDuration    metric.Float64Histogram
	renewals        metric.Int64Counter
	renewalFailures metric.Int64Counter
	leasesLost      metric.Int64Counter
	leasesHeld      metric.Int64UpDownCounter
	waiters         metric.Int64UpDownCounter
	nodeErrors      metric.Int64Counter

	base     []attribute.KeyValue // the backend attribute, when named
	plain    attrOpts             // base only
	outcome  [nOutcomes]attrOpts  // base + acquire outcome
	released attrOpts             // base + outcome released
	lost     attrOpts             // base + outcome lost

	nodeMu sync.RWMutex
	nodes  map[nodeOp]attrOpts // base + node + operation, built on first use
}

type nodeOp struct{ node, op string }

func newMeters(mp metric.MeterProvider, cfg options) (*meters, error) {
	meter := mp.Meter(ScopeName)
	m := &meters{nodes: make(map[nodeOp]attrOpts)}
	var errs []error
	count := func(name, desc, unit string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit(unit))
		errs = append(errs, err)
		return c
	}
	gauge := func(name, desc, unit string) metric.Int64UpDownCounter {
		c, err := meter.Int64UpDownCounter(name, metric.WithDescription(desc), metric.WithUnit(unit))
		errs = append(errs, err)
		return c
	}
	hist := func(name, desc string, buckets []float64) metric.Float64Histogram {
		h, err := meter.Float64Histogram(name, metric.WithDescription(desc), metric.WithUnit("s"),
			metric.WithExplicitBucketBoundaries(buckets...))
		errs = append(errs, err)
		return h
	}
	m.acquisitions = count(MetricAcquisitions, "Acquire and TryAcquire calls, by outcome.", "{acquisition}")
	m.acquireDuration = hist(MetricAcquireDuration, "Time Acquire and TryAcquire took to return: how long callers waited for the lock, by outcome.", acquireBuckets)
	m.holdDuration = hist(MetricHoldDuration, "How long leases were held, from the grant until released or lost.", holdBuckets)
	m.renewals = count(MetricRenewals, "Successful lease renewals by the watchdog.", "{renewal}")
	m.renewalFailures = count(MetricRenewalFailures, "Failed lease renewals by the watchdog (retried until the lease could have expired).", "{renewal}")
	m.leasesLost = count(MetricLeasesLost, "Leases lost while held: the lock may have been taken by another owner.", "{lease}")
	m.leasesHeld = gauge(MetricLeasesHeld, "Leases currently held.", "{lease}")
	m.waiters = gauge(MetricWaiters, "Acquire calls currently waiting for a lock held elsewhere.", "{waiter}")
	m.nodeErrors = count(MetricNodeErrors, "Errors of single nodes among several (Redlock nodes, Cluster shards), by node and operation.", "{error}")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	if cfg.backend != "" {
		m.base = []attribute.KeyValue{AttrBackend.String(cfg.backend)}
	}
	with := func(kv ...attribute.KeyValue) attrOpts {
		return newAttrOpts(append(append([]attribute.KeyValue(nil), m.base...), kv...)...)
	}
	m.plain = with()
	m.outcome[outAcquired] = with(AttrOutcome.String(OutcomeAcquired))
	m.outcome[outNotAcquired] = with(AttrOutcome.String(OutcomeNotAcquired))
	m.outcome[outError] = with(AttrOutcome.String(OutcomeError))
	m.released = with(AttrOutcome.String(OutcomeReleased))
	m.lost = with(AttrOutcome.String(OutcomeLost))

	// Start every counter with a fixed attribute set at zero, so that it
	// is exported (and rate() and alerts work) before its first event.
	ctx := context.Background()
	for i := range m.outcome {
		m.acquisitions.Add(ctx, 0, m.outcome[i].add...)
	}
	for _, c := range []metric.Int64Counter{m.renewals, m.renewalFailures, m.leasesLost} {
		c.Add(ctx, 0, m.plain.add...)
	}
	m.leasesHeld.Add(ctx, 0, m.plain.add...)
	m.waiters.Add(ctx, 0, m.plain.add...)
	return m, nil
}

func (m *meters) observe(ctx context.Context, e dlock.Event) {
	switch e.Kind {
	case dlock.EventAttempt:
		if e.Err != nil {
			m.countNodeErrors(ctx, e.Err, "acquire")
		}
	case dlock.EventWaitStart:
		m.waiters.Add(ctx, 1, m.plain.add...)
	case dlock.EventWaitEnd:
		m.waiters.Add(ctx, -1, m.plain.add...)
	case dlock.EventAcquireEnd:
		o := &m.outcome[outcomeOf(e.Err)]
		m.acquisitions.Add(ctx, 1, o.add...)
		m.acquireDuration.Record(ctx, e.Duration.Seconds(), o.rec...)
		if e.Err == nil && e.Lease != nil {
			m.leasesHeld.Add(ctx, 1, m.plain.add...)
		}
	case dlock.EventRenewed:
		if e.Err == nil {
			m.renewals.Add(ctx, 1, m.plain.add...)
		} else {
			m.renewalFailures.Add(ctx, 1, m.plain.add...)
			m.countNodeErrors(ctx, e.Err, "renew")
		}
	case dlock.EventLost:
		m.leasesLost.Add(ctx, 1, m.plain.add...)
		m.leasesHeld.Add(ctx, -1, m.plain.add...)
		m.holdDuration.Record(ctx, e.Duration.Seconds(), m.lost.rec...)
	case dlock.EventReleased:
		if e.Err != nil {
			m.countNodeErrors(ctx, e.Err, "release")
		}
		if endedByRelease(e) {
			m.leasesHeld.Add(ctx, -1, m.plain.add...)
			m.holdDuration.Record(ctx, e.Duration.Seconds(), m.released.rec...)
		}
	}
}

// outcomeOf classifies an Acquire result: nil is acquired; an error
// matching dlock.ErrNotAcquired (the lock was held elsewhere until the
// strategy gave up or the context ended) is not_acquired; anything else
// (server unreachable, invalid call, closed Client) is error.
func outcomeOf(err error) int {
	switch {
	case err == nil:
		return outAcquired
	case errors.Is(err, dlock.ErrNotAcquired):
		return outNotAcquired
	default:
		return outError
	}
}

// endedByRelease reports whether the Release that produced e ended the
// lease, so its hold is counted once: a lease ends exactly once, either
// lost (EventLost, already counted) or released. A Release ended it when
// the lease is now released (Lease.Err matches ErrReleased: never the
// case for a lost lease) and this call is not a repeated Release or a call
// rejected before doing anything.
func endedByRelease(e dlock.Event) bool {
	if e.Lease == nil || !errors.Is(e.Lease.Err(), dlock.ErrReleased) {
		return false
	}
	return e.Err == nil || !errors.Is(e.Err, dlock.ErrReleased) && !errors.Is(e.Err, dlock.ErrInvalidOption)
}

// countNodeErrors adds one to dlock.node.errors for every *dlock.NodeError
// in err's tree (errors.Join and %w chains), keyed by node and operation.
func (m *meters) countNodeErrors(ctx context.Context, err error, op string) {
	walkNodeErrors(err, func(ne *dlock.NodeError) {
		m.nodeErrors.Add(ctx, 1, m.nodeAttrs(ne.Node, op).add...)
	})
}

// maxNodeSets bounds the cached attribute sets; past it, sets are built
// per call (a misbehaving backend naming nodes without bound must not
// grow memory for ever).
const maxNodeSets = 1024

func (m *meters) nodeAttrs(node, op string) attrOpts {
	k := nodeOp{node, op}
	m.nodeMu.RLock()
	a, ok := m.nodes[k]
	m.nodeMu.RUnlock()
	if ok {
		return a
	}
	kvs := append(append([]attribute.KeyValue(nil), m.base...), AttrNode.String(node), AttrOperation.String(op))
	a = newAttrOpts(kvs...)
	m.nodeMu.Lock()
	if len(m.nodes) < maxNodeSets {
		m.nodes[k] = a
	}
	m.nodeMu.Unlock()
	return a
}

// walkNodeErrors calls f for every *dlock.NodeError in err's tree, in
// depth-first order, without descending into a NodeError's own cause.
// errors.As would find only the first one of a joined error.
func walkNodeErrors(err error, f func(*dlock.NodeError)) {
	for err != nil {
		switch x := err.(type) {
		case *dlock.NodeError:
			f(x)
			return
		case interface{ Unwrap() []error }:
			for _, e := range x.Unwrap() {
				walkNodeErrors(e, f)
			}
			return
		case interface{ Unwrap() error }:
			err = x.Unwrap()
		default:
			return
		}
	}
}
