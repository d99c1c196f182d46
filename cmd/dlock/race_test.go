//go:build race && unix

package main_test

// raceEnabled builds the dlock binary under test with -race too.
const raceEnabled = true
