package main

import (
	"github.com/trustbridge/trustbridge/federation"
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
