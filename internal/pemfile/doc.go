// Package pemfile parses the PEM private keys and certificate lists
// trustbridge reads from files and from peers: the CA's roots and plug-in
// CA directory, the SDS agent's credentials, the web certificate's
// mismatch check, and what the CA client receives.
//
// ParseCertificates and ParsePrivateKey are strict: the input is PEM
// blocks and whitespace only, of the one expected type, without headers,
// at most MaxSize bytes and MaxCertificates certificates. pem.Decode on
// its own skips text before a block and malformed blocks, which would let
// a damaged file pass with part of it ignored. FindCertificates is the
// one tolerant reader, for CA bundles that carry comments between their
// certificates.
//
//	certs, err := pemfile.ParseCertificates(data)
//	key, err := pemfile.ParsePrivateKey(keyData)
//
// Formats: RFC 7468 (textual encodings), RFC 5208/5958 (PKCS #8),
// RFC 5915 (SEC 1 EC keys), RFC 8017 (PKCS #1 RSA keys).
package pemfile
