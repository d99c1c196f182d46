package fence_test

import (
	"context"
	"testing"

	"github.com/dlock-go/dlock/fence"
)

// BenchmarkRedis measures a fenced write and claim against the floor of a
// plain HSET of the same fields on the same server: the ratio is the cost
// of checking the token (and the key's shape) on the server.
func BenchmarkRedis(b *testing.B) {
	ctx := context.Background()
	s := fence.NewRedis(rdb)
	key := "fence:bench"
	b.Run("floor=HSET", func(b *testing.B) {
		rdb.Del(ctx, key)
		for i := 0; b.Loop(); i++ {
			if err := rdb.HSet(ctx, key, "v", "value", "f", i+1, "o", "a").Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Set", func(b *testing.B) {
		rdb.Del(ctx, key)
		for i := 0; b.Loop(); i++ {
			if err := s.Set(ctx, key, "value", uint64(i+1), "a"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Claim", func(b *testing.B) {
		rdb.Del(ctx, key)
		for i := 0; b.Loop(); i++ {
			if _, err := s.Claim(ctx, key, uint64(i+1), "a"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
