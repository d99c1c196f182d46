package verify_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/verify"
)

// TestLong runs longer experiments on redis://local when DLOCK_VERIFY_LONG
// is set, for measurements until the CLI drives them:
//
//	DLOCK_VERIFY_LONG=1 DLOCK_VERIFY_FAULTS=pause,kill DLOCK_VERIFY_RUNS=10 \
//	DLOCK_VERIFY_DURATION=60s DLOCK_VERIFY_KEEP=/tmp/verify go test -run TestLong -timeout 0 -v
//
// Optional: DLOCK_VERIFY_WORKERS (5), DLOCK_VERIFY_TTL (1s), DLOCK_VERIFY_SEED (1).
func TestLong(t *testing.T) {
	if os.Getenv("DLOCK_VERIFY_LONG") == "" {
		t.Skip("set DLOCK_VERIFY_LONG=1 to run")
	}
	cfg := verify.DefaultConfig()
	cfg.Name = "redislock"
	cfg.Exe = workerExe(t)
	cfg.OutDir = outDir(t)
	cfg.Progress = func(msg string) { t.Log(msg) }
	if s := os.Getenv("DLOCK_VERIFY_FAULTS"); s != "" {
		cfg.Faults = strings.Split(s, ",")
	}
	env := func(name string, parse func(string) error) {
		if s := os.Getenv(name); s != "" {
			if err := parse(s); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
	}
	env("DLOCK_VERIFY_RUNS", func(s string) (err error) { cfg.Runs, err = strconv.Atoi(s); return })
	env("DLOCK_VERIFY_WORKERS", func(s string) (err error) { cfg.Workers, err = strconv.Atoi(s); return })
	env("DLOCK_VERIFY_SEED", func(s string) (err error) { cfg.Seed, err = strconv.ParseInt(s, 10, 64); return })
	env("DLOCK_VERIFY_DURATION", func(s string) (err error) { cfg.Duration, err = time.ParseDuration(s); return })
	env("DLOCK_VERIFY_TTL", func(s string) (err error) { cfg.TTL, err = time.ParseDuration(s); return })
	rep, err := verify.Run(context.Background(), cfg, open)
	if rep != nil {
		t.Logf("\n%s", rep.Table())
	}
	if err != nil {
		t.Fatal(err)
	}
}
