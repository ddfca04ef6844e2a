// Package jwt is trustbridge jwt: mint a JWT-SVID for one's own identity
// from a running server, and validate one against SPIFFE bundles from
// files or from the server.
package jwt
