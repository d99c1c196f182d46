// Package dlockotel records OpenTelemetry metrics and traces of a
// dlock.Client: how often locks are acquired, lost and renewed, how long
// callers wait and hold, and a span per Acquire and Release.
//
// It is its own module (github.com/dlock-go/dlock/dlockotel) so that users
// of dlock who do not want OpenTelemetry never download it.
//
//	c := dlock.New(redislock.New(rdb),
//		dlockotel.WithMeterProvider(otel.GetMeterProvider(), dlockotel.WithBackendName("redis")),
//		dlockotel.WithTracerProvider(otel.GetTracerProvider(), dlockotel.WithBackendName("redis")),
//	)
//
// Without these options nothing is recorded and the Client does no work
// for observability at all. Given a no-op provider (packages
// go.opentelemetry.io/otel/metric/noop, go.opentelemetry.io/otel/trace/noop)
// they install nothing either, so an Acquire costs exactly what it costs
// without them. Given real providers, metric recording allocates nothing
// per event: attribute sets and option slices are built once, when the
// option is applied.
//
// # Metrics
//
// All instruments come from the meter named ScopeName. Every point carries
// dlock.backend when WithBackendName is given (left out otherwise). Keys
// are never metric attributes (unbounded cardinality); they are on spans.
//
//	Name                    Instrument     Unit           Attributes                         Meaning
//	dlock.acquisitions      Counter        {acquisition}  dlock.outcome                      Acquire/TryAcquire calls; outcome acquired, not_acquired (held elsewhere until the strategy gave up or ctx ended) or error (the server failed)
//	dlock.acquire.duration  Histogram      s              dlock.outcome                      wait time: from the call to its return, attempts and waiting included
//	dlock.hold.duration     Histogram      s              dlock.outcome (released, lost)     hold time: from the grant to the end of the lease
//	dlock.renewals          Counter        {renewal}      -                                  successful renewals by the watchdog
//	dlock.renewal.failures  Counter        {renewal}      -                                  failed renewals (retried until the lease could have expired)
//	dlock.leases.lost       Counter        {lease}        -                                  leases lost while held (Lease.Done closed with ErrLost)
//	dlock.leases.held       UpDownCounter  {lease}        -                                  leases currently held (one per Acquire, nested reentrant ones included)
//	dlock.waiters           UpDownCounter  {waiter}       -                                  Acquire calls currently waiting for a lock held elsewhere
//	dlock.node.errors       Counter        {error}        dlock.node, dlock.operation        errors of single nodes (Redlock, Cluster): one per *dlock.NodeError in the error's tree; operation acquire, renew or release
//
// The counters and up-down counters with a fixed attribute set start at 0
// when the option is created, so they are exported before their first
// event; the histograms and dlock.node.errors appear with their first
// measurement. The histograms advise explicit bucket boundaries suited to
// seconds (0.5ms to 60s for waits, 1ms to 1h for holds); a View may
// override them. Through the OpenTelemetry Prometheus exporter (default
// name translation) the names become dlock_acquisitions_total,
// dlock_acquire_duration_seconds, dlock_hold_duration_seconds,
// dlock_renewals_total, dlock_renewal_failures_total,
// dlock_leases_lost_total, dlock_leases_held, dlock_waiters and
// dlock_node_errors_total (verified with exporters/prometheus v0.63.0).
//
// Calls the Client rejects before any attempt (an invalid key or option,
// a closed Client) are not observed, so not counted.
//
// A lease is counted in dlock.hold.duration and taken off
// dlock.leases.held exactly once: when it is lost, or by the Release that
// ended it (not by a repeated Release, nor by the Release of a lease that
// was already lost).
//
// Node errors are counted from failed acquisition attempts, renewals and
// releases. A Redlock attempt that reached its quorum returns no error, so
// the failures of its minority nodes are not seen.
//
// # Traces
//
// Spans come from the tracer named ScopeName and carry dlock.key and
// (when named) dlock.backend.
//
//   - dlock.acquire: one per Acquire or TryAcquire (and per key of
//     AcquireMany), a child of the span in the caller's ctx, started when the call begins and ended when it
//     returns. Its context is the one the backend receives, so spans of an
//     instrumented driver (go-redis, etcd) nest under it. Each attempt is
//     a span event dlock.attempt (dlock.attempt.number,
//     dlock.granted, dlock.holder_ttl in seconds when known, dlock.error
//     when the attempt failed); a wait is bracketed by the events
//     dlock.wait.start and dlock.wait.end. On success the span gets
//     dlock.outcome=acquired, dlock.fence and dlock.count; otherwise
//     dlock.outcome (not_acquired or error) and status Error (with the
//     error recorded as an exception event when outcome is error).
//   - dlock.release: one per Lease.Release (also those made by Client.Do),
//     a child of the span in the Release ctx, and one per live lease that
//     Client.Close releases, a root span; each is linked to the
//     lease's dlock.acquire span; attributes dlock.fence and dlock.held
//     (seconds held); status Error when Release returned an error. It
//     spans the whole Release, and its context is the one the backend
//     receives.
//   - dlock.lost: a span (not an event: the dlock.acquire span has ended by
//     then) for each lost lease, a new root since the loss is detected by
//     the watchdog outside any caller's trace, linked to the lease's
//     dlock.acquire span; attributes dlock.fence and dlock.held; status
//     Error with the cause recorded. It has no duration.
//
// Renewals make no spans (they are periodic background work): watch
// dlock.renewals and dlock.renewal.failures instead.
//
// Structured logs are the core's: dlock.WithLogger.
package dlockotel
