//go:build !unix

package verify

import (
	"errors"
	"os/exec"
	"time"
)

const supported = false

var errUnsupported = errors.New("verify: worker processes and fault injection need a Unix system")

var start = time.Now()

func monoNow() int64           { return int64(time.Since(start)) }
func stopProcess(int) error    { return errUnsupported }
func contProcess(int) error    { return errUnsupported }
func killProcess(int) error    { return errUnsupported }
func setWorkerAttrs(*exec.Cmd) {}
