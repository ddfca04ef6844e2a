package server

import (
	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
)

// jwtSigner is what mints JWT-SVIDs on the certificate service: the CA
// (ca.Authority.SignJWT), or test, a test hook, when set.
func jwtSigner(a *ca.Authority, test certservice.JWTSigner) certservice.JWTSigner {
	if test != nil {
		return test
	}
	return a
}
