//go:build !race

package redlock_test

// raceEnabled reports that the race detector is on: code runs about ten
// times slower, so load tests scale down.
const raceEnabled = false
