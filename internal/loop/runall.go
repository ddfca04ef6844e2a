// Package runall runs the parts of a process together: they start at once,
// and whichever ends first, with an error or not, ends the others, because
// a half-running server would look healthy while part of it is gone.
package loop

import "context"

// Run runs every part until one returns, then cancels the context of the
// others, waits for all, and returns the first error any returned.
func RunAll(ctx context.Context, parts ...func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(parts))
	for _, run := range parts {
		go func() { errs <- run(ctx) }()
	}
	var first error
	for range parts {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
		cancel()
	}
	return first
}
