package fence_test

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

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
	err := s.Set(ctx, key, "v", 1, "a")
	if err == nil {
		t.Fatal("Set on a list key: got nil error")
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
