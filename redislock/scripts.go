package redislock

import (
	_ "embed"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The scripts, embedded from their .lua files. A line "--#include NAME"
// in a script is replaced by the library file NAME (lib.lua,
// queue_lib.lua, kind_lib.lua, kind_queue_lib.lua), so each operation
// stays one EVALSHA and each script creates the library functions only
// where its slower paths need them. redis.Script runs them with EVALSHA
// and falls back to EVAL when the server answers NOSCRIPT (after a
// restart or SCRIPT FLUSH); RefreshMany and the WithReplicas pipelines do
// the same.
var (
	//go:embed lib.lua
	lib string
	//go:embed queue_lib.lua
	queueLib string
	//go:embed acquire.lua
	acquireSrc string
	//go:embed acquire_all.lua
	acquireAllSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed refresh.lua
	refreshSrc string
	//go:embed inspect.lua
	inspectSrc string
	//go:embed queue.lua
	queueSrc string
	//go:embed leave.lua
	leaveSrc string
	//go:embed agree.lua
	agreeSrc string
	//go:embed kind_lib.lua
	kindLib string
	//go:embed kind_queue_lib.lua
	kindQueueLib string
	//go:embed kind_acquire.lua
	kindAcquireSrc string
	//go:embed kind_release.lua
	kindReleaseSrc string
	//go:embed kind_refresh.lua
	kindRefreshSrc string
	//go:embed kind_claim.lua
	kindClaimSrc string
	//go:embed kind_inspect.lua
	kindInspectSrc string
	//go:embed kind_value.lua
	kindValueSrc string
	//go:embed kind_queue.lua
	kindQueueSrc string
	//go:embed kind_leave.lua
	kindLeaveSrc string

	acquireScript    = script(acquireSrc)
	acquireAllScript = script(acquireAllSrc)
	releaseScript    = script(releaseSrc)
	refreshScript    = script(refreshSrc)
	inspectScript    = script(inspectSrc)
	queueScript      = script(queueSrc)
	leaveScript      = script(leaveSrc)
	agreeScript      = script(agreeSrc)

	kindAcquireScript = script(kindAcquireSrc)
	kindReleaseScript = script(kindReleaseSrc)
	kindRefreshScript = script(kindRefreshSrc)
	kindClaimScript   = script(kindClaimSrc)
	kindInspectScript = script(kindInspectSrc)
	kindValueScript   = script(kindValueSrc)
	kindQueueScript   = script(kindQueueSrc)
	kindLeaveScript   = script(kindLeaveSrc)
)

// script expands the "--#include NAME" lines of src and returns the
// script. An unknown NAME is a bug in this package: it panics when the
// package is initialised, before any user input is seen.
func script(src string) *redis.Script {
	libs := map[string]string{"lib.lua": lib, "queue_lib.lua": queueLib, "kind_lib.lua": kindLib,
		"kind_queue_lib.lua": kindQueueLib}
	lines := strings.SplitAfter(src, "\n")
	for i, l := range lines {
		name, ok := strings.CutPrefix(strings.TrimRight(l, "\n"), "--#include ")
		if !ok {
			continue
		}
		lib, known := libs[name]
		if !known {
			panic("redislock: script includes unknown file " + name)
		}
		lines[i] = lib + "\n"
	}
	full := strings.Join(lines, "")
	sc := redis.NewScript(full)
	sources[sc] = full
	return sc
}

// sources holds each script's expanded source, for EVAL (redis.Script
// does not give it out).
var sources = map[*redis.Script]string{}

// scriptSource returns the source of a script of this package.
func scriptSource(s *redis.Script) string { return sources[s] }
