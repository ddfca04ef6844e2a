package authn

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// Metadata keys read from a call; gRPC lowercases keys. Istio's agents and
// ztunnel send "ClusterID": the Kubernetes cluster their token comes from.
const (
	authorizationKey = "authorization"
	clusterIDKey     = "clusterid"
)

// FromGRPC builds a Request from a gRPC server handler or stream context:
// the client's TLS certificates (not verified: that is X509SVID's job), the
// bearer token from the "authorization" metadata and the peer address.
//
// The "Bearer" scheme matches case-insensitively (RFC 9110 §11.1) and the
// token must be an RFC 6750 b64token of at most MaxTokenSize bytes. When
// the metadata cannot be used (several authorization values, which could
// make two components disagree on which token counts; another scheme; a
// malformed token) BearerToken stays "" and AuthorizationError says why, so
// the token authenticators refuse instead of reporting no credentials.
func FromGRPC(ctx context.Context) Request {
	var r Request
	if p, ok := peer.FromContext(ctx); ok {
		if p.Addr != nil {
			r.Peer = p.Addr.String()
		}
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			r.PeerCertificates = slices.Clone(ti.State.PeerCertificates)
		}
	}
	md, _ := metadata.FromIncomingContext(ctx)
	switch values := md.Get(authorizationKey); len(values) {
	case 0:
	case 1:
		r.BearerToken, r.AuthorizationError = parseAuthorization(values[0])
	default:
		r.AuthorizationError = fmt.Errorf("authorization metadata has %d values, want one", len(values))
	}
	r.ClusterIDs = slices.Clone(md.Get(clusterIDKey))
	return r
}

// parseAuthorization returns the token of an "authorization" value
// "Bearer <token>". Errors never include the token.
func parseAuthorization(v string) (string, error) {
	v = strings.Trim(v, " \t")
	scheme, token, found := strings.Cut(v, " ")
	if !found {
		// A tab also separates scheme and token in HTTP.
		scheme, token, found = strings.Cut(v, "\t")
	}
	if !strings.EqualFold(scheme, "bearer") {
		// The scheme is not echoed: without a space, it is the whole value,
		// which may be a bare token.
		return "", errors.New("authorization scheme is not Bearer")
	}
	if !found {
		return "", errors.New("authorization: bearer token is empty")
	}
	token = strings.TrimLeft(token, " \t")
	switch {
	case token == "":
		return "", errors.New("authorization: bearer token is empty")
	case len(token) > MaxTokenSize:
		return "", fmt.Errorf("authorization: bearer token is %d bytes, more than %d", len(token), MaxTokenSize)
	case !isToken68(token):
		return "", errors.New("authorization: bearer token has characters outside the RFC 6750 b64token set")
	}
	return token, nil
}

// isToken68 reports whether s is an RFC 6750 b64token:
// 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"=".
func isToken68(s string) bool {
	body := strings.TrimRight(s, "=")
	if body == "" {
		return false
	}
	for i := 0; i < len(body); i++ {
		c := body[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '-', c == '.', c == '_', c == '~', c == '+', c == '/':
		default:
			return false
		}
	}
	return true
}
