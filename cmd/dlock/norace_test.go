//go:build !race && unix

package main_test

const raceEnabled = false
