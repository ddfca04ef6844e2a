package main

import "github.com/trustbridge/trustbridge/internal/server/api"

// Every trustbridge publishes its JWT signing keys next to its roots;
// tests that count roots count the X.509 authorities.

func x509Held(as []api.FederationAuthority) []api.FederationAuthority {
	var out []api.FederationAuthority
	for _, a := range as {
		if a.Kind == api.KindX509 {
			out = append(out, a)
		}
	}
	return out
}
