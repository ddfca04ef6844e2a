package server

import (
	"github.com/trustbridge/trustbridge/internal/server/trustview"
)

func x509Viewed(as []trustview.Authority) []trustview.Authority {
	var out []trustview.Authority
	for _, a := range as {
		if a.Kind == trustview.KindX509 {
			out = append(out, a)
		}
	}
	return out
}
