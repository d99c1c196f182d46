//go:build !linux

package redislock_test

import (
	"testing"
	"time"
)

// processCPU and threadsCPU read 0 outside Linux (see cost).
func processCPU(b *testing.B) time.Duration { return 0 }

func threadsCPU(b *testing.B, pid int) time.Duration { return 0 }
