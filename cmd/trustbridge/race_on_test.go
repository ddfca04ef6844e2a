//go:build race

package main

// raceEnabled: the race detector is on, and its shadow memory counts in
// the process's RSS.
const raceEnabled = true
