package server

import (
	"github.com/trustbridge/trustbridge/internal/server/api"
)

func x509Viewed(as []api.Authority) []api.Authority {
	var out []api.Authority
	for _, a := range as {
		if a.Kind == api.KindX509 {
			out = append(out, a)
		}
	}
	return out
}
