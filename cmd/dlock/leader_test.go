//go:build unix

package main_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// leaderShowJSON is `dlock leader show --json`, and a line of `leader
// watch --json`.
type leaderShowJSON struct {
	Time    string `json:"time"`
	Key     string `json:"key"`
	Leader  bool   `json:"leader"`
	Value   string `json:"value"`
	Term    uint64 `json:"term"`
	Owner   string `json:"owner"`
	Backend string `json:"backend"`
}

// leaderScript prints the leader's variables and "ready", then waits
// until the file $1 exists.
const leaderScript = `echo "term=$DLOCK_TERM fence=$DLOCK_FENCE owner=$DLOCK_OWNER"; echo ready; while [ ! -e "$1" ]; do sleep 0.02; done`

// leaderVars returns DLOCK_TERM, DLOCK_FENCE and DLOCK_OWNER as printed
// by leaderScript in stdout.
func leaderVars(t *testing.T, stdout string) (term, fence uint64, owner string) {
	t.Helper()
	line, _, _ := strings.Cut(stdout, "\n")
	if _, err := fmt.Sscanf(line, "term=%d fence=%d owner=%s", &term, &fence, &owner); err != nil {
		t.Fatalf("leader's environment: %v in %q", err, line)
	}
	return term, fence, owner
}

// testLeaderRunShow: `leader run` runs the command with DLOCK_TERM =
// DLOCK_FENCE; `leader show` and `inspect` report the campaigner's value
// and term; another campaigner with --wait 0 exits 75; after the command
// exits the leadership is given up (leader show exits 3).
func testLeaderRunShow(t *testing.T, url string) {
	key := keyFor(t)
	gofile := t.TempDir() + "/go"
	ld := startDlock(t, on(url, "leader", "run", "--ttl", "5s", "--value", "web-1 blue", key, "--", "sh", "-c", leaderScript, "leader", gofile)...)
	ld.await("ready")
	term, fence, owner := leaderVars(t, ld.out.String())
	if term == 0 || term != fence || owner == "" {
		t.Fatalf("leader's environment: DLOCK_TERM %d, DLOCK_FENCE %d, DLOCK_OWNER %q; want equal non-zero terms and an owner", term, fence, owner)
	}

	show := dlockRun(t, on(url, "leader", "show", key)...)
	assertCode(t, show, 0)
	for _, re := range []string{
		`(?m)^leader\s+yes$`,
		`(?m)^value\s+web-1 blue$`,
		fmt.Sprintf(`(?m)^term\s+%d$`, term),
		`(?m)^owner\s+` + regexpQuote(owner) + `$`,
		`(?m)^ttl\s+\S+$`,
	} {
		if !regexpMatch(re, show.stdout) {
			t.Errorf("leader show output %q does not match %s", show.stdout, re)
		}
	}
	js := dlockRun(t, on(url, "leader", "show", "--json", key)...)
	assertCode(t, js, 0)
	var j leaderShowJSON
	if err := json.Unmarshal([]byte(js.stdout), &j); err != nil {
		t.Fatalf("leader show --json: %v in %q", err, js.stdout)
	}
	if want := (leaderShowJSON{Key: key, Leader: true, Value: "web-1 blue", Term: term, Owner: owner, Backend: "zk"}); j != want {
		t.Errorf("leader show --json: got %+v, want %+v", j, want)
	}
	if in := inspectKey(t, url, key); in.Value != "web-1 blue" || in.Fence != term || in.Kind != "lock" {
		t.Errorf("inspect --json of the election: got %+v, want value %q, fence %d, kind lock", in, "web-1 blue", term)
	}

	other := dlockRun(t, on(url, "leader", "run", "--ttl", "5s", "--wait", "0", "--value", "web-2", key, "--", "true")...)
	assertCode(t, other, 75)
	assertContains(t, "a second campaigner: stderr", other.stderr, fmt.Sprintf(`election %q has another leader`, key), `value "web-1 blue"`)

	letGo(t, strings.TrimSuffix(gofile, "/go"))
	assertCode(t, ld.wait(30*time.Second), 0)
	none := dlockRun(t, on(url, "leader", "show", key)...)
	assertCode(t, none, 3)
	if !regexpMatch(`(?m)^leader\s+none$`, none.stdout) || none.stderr != "" {
		t.Errorf("leader show after resigning: stdout %q, stderr %q; want leader none and no error", none.stdout, none.stderr)
	}
	noneJSON := dlockRun(t, on(url, "leader", "show", "--json", key)...)
	assertCode(t, noneJSON, 3)
	if err := json.Unmarshal([]byte(noneJSON.stdout), &j); err != nil || j.Leader || j.Key != key {
		t.Errorf("leader show --json after resigning: got %q (%v), want leader false", noneJSON.stdout, err)
	}

	// The next leader's term is above the last one.
	next := dlockRun(t, on(url, "leader", "run", "--ttl", "5s", key, "--", "sh", "-c", `echo "$DLOCK_TERM"`)...)
	assertCode(t, next, 0)
	if n, err := strconv.ParseUint(strings.TrimSpace(next.stdout), 10, 64); err != nil || n <= term {
		t.Errorf("the next leader's DLOCK_TERM: got %q, want a number above %d", next.stdout, term)
	}
}

// testLeaderWatch: `leader watch --json` prints "no leader", then the
// leader when one is elected, then "no leader" after it resigns, and
// exits 0 on SIGINT.
func testLeaderWatch(t *testing.T, url string) {
	key := keyFor(t)
	w := startDlock(t, on(url, "leader", "watch", "--json", key)...)
	next := func() leaderShowJSON {
		t.Helper()
		select {
		case line, ok := <-w.lines:
			if !ok {
				t.Fatalf("leader watch exited; stderr %q", w.errb.String())
			}
			var j leaderShowJSON
			if err := json.Unmarshal([]byte(line), &j); err != nil || j.Time == "" || j.Key != key {
				t.Fatalf("leader watch --json line %q (%v): want a JSON object with time and key", line, err)
			}
			return j
		case <-time.After(30 * time.Second):
			t.Fatalf("leader watch printed nothing within 30s; stderr %q", w.errb.String())
		}
		panic("unreachable")
	}
	if j := next(); j.Leader {
		t.Fatalf("first line: got %+v, want no leader", j)
	}
	gofile := t.TempDir() + "/go"
	ld := startDlock(t, on(url, "leader", "run", "--ttl", "5s", "--value", "v1", key, "--", "sh", "-c", leaderScript, "leader", gofile)...)
	ld.await("ready")
	term, _, _ := leaderVars(t, ld.out.String())
	if j := next(); !j.Leader || j.Value != "v1" || j.Term != term {
		t.Errorf("after the election: got %+v, want leader v1 with term %d", j, term)
	}
	letGo(t, strings.TrimSuffix(gofile, "/go"))
	assertCode(t, ld.wait(30*time.Second), 0)
	if j := next(); j.Leader {
		t.Errorf("after the leader resigned: got %+v, want no leader", j)
	}
	if err := w.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	assertCode(t, w.wait(10*time.Second), 0)
}

// testLeaderLost: a leader whose leadership is removed (release --force)
// is told, its command gets SIGTERM, and dlock exits 76, as run does on a
// lost lease.
func testLeaderLost(t *testing.T, url string) {
	key := keyFor(t)
	ld := startDlock(t, on(url, "leader", "run", "--ttl", "5s", key, "--", "sh", "-c", trapScript)...)
	ld.await("ready")
	assertCode(t, dlockRun(t, on(url, "release", "--force", key)...), 0)
	r := ld.wait(30 * time.Second)
	assertLost(t, r, fmt.Sprintf("leader run: lost the leadership of %q", key))
}
