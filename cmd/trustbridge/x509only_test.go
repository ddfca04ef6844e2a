package main

import (
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/server/trustview"
)

// Every trustbridge publishes its JWT signing keys next to its roots;
// tests that count roots count the X.509 authorities.

func x509Held(as []federation.AuthorityInfo) []federation.AuthorityInfo {
	var out []federation.AuthorityInfo
	for _, a := range as {
		if a.Kind == federation.AuthorityX509 {
			out = append(out, a)
		}
	}
	return out
}

func x509Viewed(as []trustview.Authority) []trustview.Authority {
	var out []trustview.Authority
	for _, a := range as {
		if a.Kind == trustview.KindX509 {
			out = append(out, a)
		}
	}
	return out
}
