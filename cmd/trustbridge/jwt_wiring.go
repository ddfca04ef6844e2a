package main

import (
	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
)

// jwtSigner is what mints JWT-SVIDs on the certificate service: the CA,
// once it can (ca.Authority.SignJWT, issue 17 item 1), else nil, which
// the identity service answers with FailedPrecondition. test, a test
// hook, comes first.
//
// The assertion keeps this file building before Authority.SignJWT
// exists; once it does, `return a` (a compile-time check) replaces it.
func jwtSigner(a *ca.Authority, test certservice.JWTSigner) certservice.JWTSigner {
	if test != nil {
		return test
	}
	if s, ok := any(a).(certservice.JWTSigner); ok {
		return s
	}
	return nil
}
