// Package testlog captures logs in tests: a buffer the code under test may
// write to from any goroutine while the test reads it.
//
//	var logs testlog.Buffer
//	logger := slog.New(slog.NewTextHandler(&logs, nil))
//	...
//	assert.Contains(t, logs.String(), "refused")
package testlog

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent Write and String.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	// With checkJSON (JSONLines), partial holds the line being written
	// and bad the lines that failed CheckJSONLine.
	checkJSON bool
	partial   []byte
	bad       []string
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.checkJSON {
		b.checkLinesLocked(p)
	}
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
