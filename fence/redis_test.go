package fence_test

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fence"
	"github.com/dlock-go/dlock/internal/locktest/testmain"
	"github.com/dlock-go/dlock/internal/testserver"
)

var rdb *redis.Client

func TestMain(m *testing.M) {
	srv, err := testserver.StartRedis(testserver.RedisOptions{})
	if err != nil {
		testmain.Fail("fence", err)
	}
	rdb = redis.NewClient(&redis.Options{Addr: srv.Addr()})
	testmain.Run(m, "fence", func() error {
		rdb.Close()
		return srv.Stop()
	})
}

// newStore returns a fenced store on the shared server and a key of the
// test's own, emptied.
func newStore(t *testing.T) (*fence.Redis, string) {
	t.Helper()
	key := "fence:" + t.Name()
	rdb.Del(context.Background(), key)
	return fence.NewRedis(rdb), key
}

func TestRedisRule(t *testing.T) {
	ctx := context.Background()
	s, key := newStore(t)
	steps := []struct {
		value string
		fence uint64
		owner string
		ok    bool
	}{
		{"v1", 5, "a", true},
		{"v2", 5, "a", true},
		{"x", 5, "b", false},
		{"x", 4, "c", false},
		{"v3", 1_764_000_000_000_000, "d", true}, // a TIME-µs sized fence
		{"x", 9, "a", false},
	}
	for i, st := range steps {
		err := s.Set(ctx, key, st.value, st.fence, st.owner)
		if (err == nil) != st.ok {
			t.Fatalf("step %d Set(fence %d, %s): got %v, want ok=%v", i, st.fence, st.owner, err, st.ok)
		}
		var se *fence.StaleError
		if err != nil && (!errors.Is(err, fence.ErrStale) || !errors.As(err, &se) || se.Highest < st.fence) {
			t.Fatalf("step %d: got %v, want a StaleError with the highest fence", i, err)
		}
	}
	v, f, err := s.Get(ctx, key)
	if err != nil || v != "v3" || f != 1_764_000_000_000_000 {
		t.Fatalf("Get: got %q, %d, %v; want v3, 1764000000000000, nil", v, f, err)
	}
	if v, f, err := s.Get(ctx, key+":missing"); err != nil || v != "" || f != 0 {
		t.Fatalf("Get of a missing key: got %q, %d, %v", v, f, err)
	}
}

func TestRedisWrongType(t *testing.T) {
	ctx := context.Background()
	s, key := newStore(t)
	rdb.RPush(ctx, key, "user data")
	if err := s.Set(ctx, key, "v", 1, "a"); !errors.Is(err, dlock.ErrWrongType) || !strings.Contains(err.Error(), "list") {
		t.Fatalf("Set on a list key: got %v, want an error matching dlock.ErrWrongType naming list", err)
	}
	if _, err := s.Claim(ctx, key, 1, "a"); !errors.Is(err, dlock.ErrWrongType) {
		t.Fatalf("Claim on a list key: got %v, want an error matching dlock.ErrWrongType", err)
	}
	if _, _, err := s.Get(ctx, key); !errors.Is(err, dlock.ErrWrongType) {
		t.Fatalf("Get on a list key: got %v, want an error matching dlock.ErrWrongType", err)
	}
	if n, _ := rdb.LLen(ctx, key).Result(); n != 1 {
		t.Fatalf("list length after the failed Set: got %d, want 1", n)
	}
}

func TestRedisClaim(t *testing.T) {
	ctx := context.Background()
	s, key := newStore(t)
	if v, err := s.Claim(ctx, key, 5, "a"); err != nil || v != "" {
		t.Fatalf("Claim of a missing key: got %q, %v", v, err)
	}
	if err := s.Set(ctx, key, "10", 5, "a"); err != nil {
		t.Fatal(err)
	}
	// B claims with a newer fence: A's pending write is now refused.
	if v, err := s.Claim(ctx, key, 6, "b"); err != nil || v != "10" {
		t.Fatalf("Claim with a newer fence: got %q, %v; want \"10\"", v, err)
	}
	if err := s.Set(ctx, key, "11", 5, "a"); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("old holder's write after a newer claim: got %v, want ErrStale", err)
	}
	if _, err := s.Claim(ctx, key, 5, "a"); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("old holder's claim: got %v, want ErrStale", err)
	}
	if err := s.Set(ctx, key, "11", 6, "b"); err != nil {
		t.Fatalf("new holder's write: %v", err)
	}
}

// The Redis store applies the token rule; values written before epochs
// were used (no epoch field) are epoch 0.
func TestRedisEpochs(t *testing.T) {
	ctx := context.Background()
	s, key := newStore(t)
	const oldFence = 1_764_000_000_000_000
	// A value as stored before epochs: no "e" field.
	if err := rdb.HSet(ctx, key, "v", "old", "f", oldFence, "o", "a").Err(); err != nil {
		t.Fatal(err)
	}
	if _, tok, err := s.GetToken(ctx, key); err != nil || tok != (fence.Token{Fence: oldFence}) {
		t.Fatalf("GetToken of a value without an epoch: got %v, %v; want epoch 0 fence %d", tok, err, oldFence)
	}
	if err := s.SetToken(ctx, key, "new", fence.Token{Epoch: 1, Fence: 12}, "b"); err != nil {
		t.Fatalf("first write of epoch 1: %v", err)
	}
	err := s.Set(ctx, key, "late", oldFence+1, "a")
	var se *fence.StaleError
	if !errors.As(err, &se) || se.HighestEpoch != 1 || se.Highest != 12 {
		t.Fatalf("late write of epoch 0: got %v, want a StaleError with highest epoch 1 fence 12", err)
	}
	if _, err := s.ClaimToken(ctx, key, fence.Token{Epoch: 1, Fence: 11}, "c"); !errors.As(err, &se) || se.HighestEpoch != 1 || se.Highest != 12 {
		t.Fatalf("claim with an older fence of epoch 1: got %v, want a StaleError with highest epoch 1 fence 12", err)
	}
	if v, err := s.ClaimToken(ctx, key, fence.Token{Epoch: 2, Fence: 1}, "d"); err != nil || v != "new" {
		t.Fatalf("claim of epoch 2: got %q, %v; want \"new\"", v, err)
	}
	if err := s.SetToken(ctx, key, "x", fence.Token{Epoch: 1, Fence: 99}, "b"); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("write of epoch 1 after a claim of epoch 2: got %v, want ErrStale", err)
	}
	if v, tok, err := s.GetToken(ctx, key); err != nil || v != "new" || tok != (fence.Token{Epoch: 2, Fence: 1}) {
		t.Fatalf("GetToken: got %q, %v, %v; want \"new\", epoch 2 fence 1", v, tok, err)
	}
}

// TestRedisLargeTokens: epochs and fences compare exactly over the whole
// uint64 range (Lua numbers are doubles, exact only below 2^53: 2^53 and
// 2^53 + 1 were equal).
func TestRedisLargeTokens(t *testing.T) {
	ctx := context.Background()
	s, key := newStore(t)
	const big = uint64(1) << 53
	if err := s.SetToken(ctx, key, "new", fence.Token{Epoch: big + 1, Fence: 1}, "a"); err != nil {
		t.Fatal(err)
	}
	err := s.SetToken(ctx, key, "old", fence.Token{Epoch: big, Fence: 99}, "b")
	var se *fence.StaleError
	if !errors.As(err, &se) || se.HighestEpoch != big+1 || se.Highest != 1 {
		t.Fatalf("write of epoch 2^53 after epoch 2^53+1: got %v, want a StaleError with highest epoch %d fence 1", err, big+1)
	}
	const top = ^uint64(0)
	if err := s.SetToken(ctx, key, "top", fence.Token{Epoch: big + 1, Fence: top}, "c"); err != nil {
		t.Fatalf("fence 2^64-1: %v", err)
	}
	if _, err := s.ClaimToken(ctx, key, fence.Token{Epoch: big + 1, Fence: top - 1}, "d"); !errors.As(err, &se) || se.Highest != top {
		t.Fatalf("claim with fence 2^64-2 after 2^64-1: got %v, want a StaleError with highest %d", err, top)
	}
	if v, tok, err := s.GetToken(ctx, key); err != nil || v != "top" || tok != (fence.Token{Epoch: big + 1, Fence: top}) {
		t.Fatalf("GetToken: got %q, %v, %v", v, tok, err)
	}
}

// TestRedisNilClient: a store without a client returns errors, never
// panics.
func TestRedisNilClient(t *testing.T) {
	ctx := context.Background()
	var nilClient *redis.Client
	for _, s := range []*fence.Redis{nil, fence.NewRedis(nil), fence.NewRedis(nilClient)} {
		if err := s.Set(ctx, "k", "v", 1, "a"); err == nil {
			t.Fatal("Set: got nil, want an error")
		}
		if _, _, err := s.Get(ctx, "k"); err == nil {
			t.Fatal("Get: got nil, want an error")
		}
		if _, err := s.Claim(ctx, "k", 1, "a"); err == nil {
			t.Fatal("Claim: got nil, want an error")
		}
	}
}

// TestRedisForeignHash: Set and Claim refuse a hash that is not a value
// of the store, with an error matching dlock.ErrWrongType, and leave it as
// it was.
func TestRedisForeignHash(t *testing.T) {
	ctx := context.Background()
	s, key := newStore(t)
	for _, fields := range []map[string]string{
		{"name": "alice", "age": "30"},             // none of the store's fields
		{"v": "x", "owner": "bob"},                 // a v, but no fence
		{"v": "x", "f": "5", "o": "a", "tag": "y"}, // the store's fields and another
		{"v": "x", "f": "05", "o": "a"},            // a malformed fence
		{"f": "5", "e": "1"},                       // no owner
	} {
		rdb.Del(ctx, key)
		if err := rdb.HSet(ctx, key, fields).Err(); err != nil {
			t.Fatal(err)
		}
		calls := map[string]func() error{
			"Set": func() error { return s.Set(ctx, key, "v", 9, "a") },
			"SetToken": func() error {
				return s.SetToken(ctx, key, "v", fence.Token{Epoch: 2, Fence: 1}, "a")
			},
			"Claim": func() error { _, err := s.Claim(ctx, key, 9, "a"); return err },
		}
		for name, call := range calls {
			err := call()
			if !errors.Is(err, dlock.ErrWrongType) || !strings.HasPrefix(err.Error(), "dlock: fence: ") || !strings.Contains(err.Error(), key) {
				t.Errorf("%s on a hash %v: got %v, want a dlock: fence: error naming the key and matching dlock.ErrWrongType", name, fields, err)
			}
			if got := rdb.HGetAll(ctx, key).Val(); !maps.Equal(got, fields) {
				t.Fatalf("%s on a hash %v changed it to %v", name, fields, got)
			}
		}
		_, hasV := fields["v"]
		if _, hasF := fields["f"]; hasV && !hasF {
			if _, _, err := s.Get(ctx, key); !errors.Is(err, dlock.ErrWrongType) {
				t.Errorf("Get of a hash %v: got %v, want an error matching dlock.ErrWrongType", fields, err)
			}
		}
	}
}

// TestRedisGetAfterClaim: a key claimed but never set reads as "" with the
// claim's token.
func TestRedisGetAfterClaim(t *testing.T) {
	ctx := context.Background()
	s, key := newStore(t)
	if _, err := s.Claim(ctx, key, 5, "a"); err != nil {
		t.Fatal(err)
	}
	if v, f, err := s.Get(ctx, key); err != nil || v != "" || f != 5 {
		t.Fatalf("Get after a Claim of a missing key: got %q, %d, %v; want \"\", 5, nil", v, f, err)
	}
	if _, err := s.ClaimToken(ctx, key, fence.Token{Epoch: 2, Fence: 7}, "b"); err != nil {
		t.Fatal(err)
	}
	if v, tok, err := s.GetToken(ctx, key); err != nil || v != "" || tok != (fence.Token{Epoch: 2, Fence: 7}) {
		t.Fatalf("GetToken after a ClaimToken: got %q, %v, %v; want \"\", epoch 2 fence 7, nil", v, tok, err)
	}
}

// TestZeroFence: Guard and Redis apply the same rule to fence 0: the first
// write is accepted whatever its fence, and an equal fence from another
// owner is rejected after it, 0 included.
func TestZeroFence(t *testing.T) {
	ctx := context.Background()
	s, key := newStore(t)
	var g fence.Guard
	steps := []struct {
		tok   fence.Token
		owner string
		ok    bool
	}{
		{fence.Token{}, "a", true},                   // first write
		{fence.Token{}, "a", true},                   // the same lease again
		{fence.Token{}, "b", false},                  // equal token, other owner
		{fence.Token{Fence: 1}, "b", true},           // newer
		{fence.Token{}, "a", false},                  // older
		{fence.Token{Epoch: 1}, "c", true},           // a new epoch
		{fence.Token{Epoch: 1}, "d", false},          // equal token, other owner
		{fence.Token{Epoch: 1, Fence: 0}, "c", true}, // the same lease again
	}
	for i, st := range steps {
		for name, check := range map[string]func() error{
			"Guard": func() error { return g.CheckToken("r", st.tok, st.owner) },
			"Redis": func() error { return s.SetToken(ctx, key, "v", st.tok, st.owner) },
		} {
			err := check()
			if (err == nil) != st.ok || (err != nil && !errors.Is(err, fence.ErrStale)) {
				t.Errorf("step %d %s(%v, %s): got %v, want ok=%v", i, name, st.tok, st.owner, err, st.ok)
			}
		}
	}
}
