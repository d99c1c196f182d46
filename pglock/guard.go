package pglock

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/dlock-go/dlock"
)

// Guard checks, inside tx, that l still holds its lock with its fence and
// locks the lock's row until tx ends, so that the writes tx makes commit
// only while l holds the lock: a takeover, an expiry's takeover, a release
// and a renewal of the row all wait for tx to end. tx must be on the same
// database as the Backend. It returns nil, or an error matching
// dlock.ErrLost when the lock is no longer held by l (tx is then unusable
// for writes that need the lock: roll it back), or tx's error.
//
// Keep such a transaction short, well below the lease's TTL/3: the
// lease's own renewal waits for it too.
func (b *Backend) Guard(ctx context.Context, tx pgx.Tx, l *dlock.Lease) error {
	if b.err != nil {
		return b.err
	}
	if l == nil {
		return fmt.Errorf("pglock: guard: %w: nil lease", dlock.ErrInvalidOption)
	}
	var one int
	err := tx.QueryRow(ctx, b.stmts.guard, l.Key(), l.Owner(), int64(l.Fence())).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("pglock: guard: %w: %q is no longer held with fence %d", dlock.ErrLost, l.Key(), l.Fence())
	}
	if err != nil {
		return wrap("guard", err)
	}
	return nil
}
