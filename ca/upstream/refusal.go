package upstream

import "errors"

// refusal marks an error as the upstream's refusal.
type refusal struct{ error }

func (r refusal) Unwrap() error { return r.error }

// UpstreamRefused makes a refusal recognisable through any wrapping
// (IsRefused), including by an implementation that marks its errors
// itself.
func (refusal) UpstreamRefused() bool { return true }

// Refused marks err as a refusal, which retrying alone does not mend; its
// text is err's. nil stays nil.
func Refused(err error) error {
	if err == nil {
		return nil
	}
	return refusal{err}
}

// IsRefused says whether err, or an error it wraps, is a refusal: one
// Refused made, or any with an UpstreamRefused method returning true.
func IsRefused(err error) bool {
	var r interface{ UpstreamRefused() bool }
	return errors.As(err, &r) && r.UpstreamRefused()
}
