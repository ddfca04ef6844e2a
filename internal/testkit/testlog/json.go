package testlog

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"testing"
)

// JSONLines is a Buffer that checks every line written to it: one JSON
// object whose keys, at every level, are unique (CheckJSONLine). The test
// fails at its end, naming the lines that are not; a test that wraps the
// log writer of the code it runs with it thus checks every record that
// code wrote.
func JSONLines(tb testing.TB) *Buffer {
	b := &Buffer{checkJSON: true}
	tb.Cleanup(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if len(b.partial) > 0 {
			b.bad = append(b.bad, fmt.Sprintf("unterminated last line %q", b.partial))
		}
		for i, msg := range b.bad {
			if i == 5 {
				tb.Errorf("testlog: and %d more bad log lines", len(b.bad)-i)
				break
			}
			tb.Errorf("testlog: %s", msg)
		}
	})
	return b
}

// checkLinesLocked checks the complete lines of p, keeping a partial last
// line for the next Write.
func (b *Buffer) checkLinesLocked(p []byte) {
	b.partial = append(b.partial, p...)
	for {
		i := bytes.IndexByte(b.partial, '\n')
		if i < 0 {
			return
		}
		line := b.partial[:i]
		if err := CheckJSONLine(line); err != nil {
			b.bad = append(b.bad, fmt.Sprintf("log line %q: %v", line, err))
		}
		b.partial = b.partial[i+1:]
	}
}

// CheckJSONLine says whether line is exactly one JSON object in which no
// object repeats a key. encoding/json would take the last of two equal
// keys without a word; the decoder's tokens show both.
func CheckJSONLine(line []byte) error {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok != json.Delim('{') {
		return fmt.Errorf("not a JSON object: starts with %v", tok)
	}
	if err := checkObject(dec, ""); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("more than one JSON value on the line")
	}
	return nil
}

// checkObject reads the members of an object whose '{' was read, up to
// its '}'.
func checkObject(dec *json.Decoder, path string) error {
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		if seen[key] {
			return fmt.Errorf("key %q repeated in %s", key, orRoot(path))
		}
		seen[key] = true
		if err := checkValue(dec, path+"."+key); err != nil {
			return err
		}
	}
	_, err := dec.Token() // '}'
	return err
}

func checkValue(dec *json.Decoder, path string) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		return checkObject(dec, path)
	case json.Delim('['):
		for dec.More() {
			if err := checkValue(dec, path+"[]"); err != nil {
				return err
			}
		}
		_, err = dec.Token() // ']'
		return err
	}
	return nil
}

func orRoot(path string) string {
	if path == "" {
		return "the record"
	}
	return path
}
