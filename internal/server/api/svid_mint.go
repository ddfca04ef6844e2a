package api

import "time"

// X509SVIDMint is the body of POST /v1/svid/x509: an operator asks the
// CA to sign an X509-SVID for SPIFFEID (`trustbridge x509 mint`, SPIRE's
// `spire-server x509 mint`). The key stays with the operator: CSR only
// proves its possession and carries its public half; its names are not
// read.
type X509SVIDMint struct {
	// SPIFFEID must be of the server's own trust domain, with a path.
	SPIFFEID string `json:"spiffe_id"`
	// CSR is a PKCS#10 request, PEM.
	CSR string `json:"csr"`
	// DNSNames are DNS SANs for the leaf.
	DNSNames []string `json:"dns_names,omitempty"`
	// TTLSeconds asks for a lifetime; 0 is the server's --workload-ttl,
	// more than its --max-workload-ttl is clamped to it.
	TTLSeconds int64 `json:"ttl_seconds,omitempty"`
}

// X509SVIDMinted answers POST /v1/svid/x509.
type X509SVIDMinted struct {
	SPIFFEID string `json:"spiffe_id"`
	// Serial is the leaf's serial number, hex, as the audit log names it.
	Serial    string    `json:"serial"`
	ExpiresAt time.Time `json:"expires_at"`
	// CertChain is the leaf then the intermediates up to a root, PEM.
	CertChain string `json:"cert_chain"`
	// Bundle is the trust domain's roots the chain verifies against, PEM.
	Bundle string `json:"bundle"`
	// Warnings say where the answer differs from the request (a clamped
	// lifetime).
	Warnings []string `json:"warnings,omitempty"`
}

// JWTSVIDMint is the body of POST /v1/svid/jwt: an operator asks the CA
// to mint a JWT-SVID for SPIFFEID (`trustbridge jwt mint --spiffe-id`).
type JWTSVIDMint struct {
	// SPIFFEID must be of the server's own trust domain, with a path.
	SPIFFEID string   `json:"spiffe_id"`
	Audience []string `json:"audience"`
	// TTLSeconds asks for a lifetime; 0 is the server's default, more
	// than its maximum is clamped to it.
	TTLSeconds int64 `json:"ttl_seconds,omitempty"`
}

// JWTSVIDMinted answers POST /v1/svid/jwt; its fields are those of `jwt
// mint -o json` with a CA, and Warnings.
type JWTSVIDMinted struct {
	SPIFFEID  string    `json:"spiffe_id"`
	ExpiresAt time.Time `json:"expires_at"`
	Token     string    `json:"token"`
	Warnings  []string  `json:"warnings,omitempty"`
}
