//go:build !unix

package authn

// lockDir is a no-op where flock is unavailable: run one token create at
// a time.
func lockDir(string) (func(), error) { return func() {}, nil }
