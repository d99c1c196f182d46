package release

import (
	"context"
	"testing"
	"time"
)

func TestContext(t *testing.T) {
	type key struct{}
	base := context.WithValue(context.Background(), key{}, "v")
	ended, cancel := context.WithCancel(base)
	cancel()
	short, cancelShort := context.WithTimeout(base, time.Hour)
	defer cancelShort()
	for _, tc := range []struct {
		name string
		ctx  context.Context
	}{
		{"no deadline", base},
		{"ended", ended},
		{"a later deadline", short},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := Context(tc.ctx, 5*time.Second)
			defer cancel()
			if ctx.Err() != nil {
				t.Fatalf("Err: %v, want nil", ctx.Err())
			}
			if ctx.Value(key{}) != "v" {
				t.Fatal("the caller's values are lost")
			}
			dl, ok := ctx.Deadline()
			if left := time.Until(dl); !ok || left > 5*time.Second || left <= 4*time.Second {
				t.Fatalf("deadline in %v (%v), want in (4s, 5s]: the 5s bound", left, ok)
			}
		})
	}
	t.Run("caller's deadline kept", func(t *testing.T) {
		soon, cancel := context.WithTimeout(base, time.Second)
		defer cancel()
		ctx, cancel2 := Context(soon, 5*time.Second)
		defer cancel2()
		dl, _ := ctx.Deadline()
		if want, _ := soon.Deadline(); !dl.Equal(want) {
			t.Fatalf("deadline %v, want the caller's %v", dl, want)
		}
		cancel()
		if ctx.Err() == nil {
			t.Fatal("the caller's cancellation does not reach it")
		}
	})
}
