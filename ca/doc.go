// Package ca is trustbridge's embedded certificate authority for one trust
// domain: roots kept on disk, rotated the way federated peers need, and
// signing of workload CSRs for identities the caller has proved.
//
// Two modes. Self-signed (default): Authority creates a root on first
// start (unique subject, SPIFFE ID URI SAN spiffe://<td>, URI name
// constraint to the trust domain) and rotates it on a timeline. A
// successor is prepared, that is published in the bundle, at half the
// active root's life; it becomes active, and signs, no earlier than
// PublishLead (5) refresh hints later, so every peer polling at the hint
// has it before it meets a certificate it signed (SPIFFE Federation §4.1).
// The old root is retired and stays published until every leaf it could
// have signed has expired. Each change to the published set moves the
// bundle's spiffe_sequence to nextSequence: one more, and at least the
// Unix time in seconds; a process's first write of the state moves it
// too, so a restored backup or a new backend never publishes a sequence
// below one peers already hold (sequence.go). Plug-in mode
// (Config.Plugin): Istio's cacerts directory, validated and watched by
// PluginWatcher; a bad change keeps the last good material and makes
// Ready report the error.
//
// JWT-SVID signing keys (JWTKeyType: ES256 default, ES384, RS256 of 3072
// bits) follow the same timeline, with MaxJWTSVIDTTL in place of the
// workload TTL: a fresh CA's first key signs at once (no peer can hold its
// bundle yet); state from before JWT keys, whose bundle peers already
// poll, gets a prepared first key that signs PublishLead hints later
// (until then SignJWT says when); a key's successor is published at half
// its JWTKeyTTL and signs PublishLead hints later, and a retired key stays
// published until the longest JWT-SVID it could have signed has expired.
// They appear in the bundle as JWT authorities (use jwt-svid) under their kid, the RFC 7638 thumbprint.
// SignJWT mints with the active key (internal/jwtsvid); Rotate leaves
// them alone, rotateJWTKey (`ca rotate --jwt`) rotates them. They are the
// CA's own in plug-in mode too. Ready does not depend on them: a follower
// of an earlier leader that wrote none keeps serving X.509 and refuses
// SignJWT with ErrInvalidSigningMaterial (trustbridge_ca_jwt_keys{state=
// "active"} is 0), so a rolling upgrade is not stalled.
//
// Inside, Authority is SPIRE's split of a server CA: a manager
// (manager*.go) owns the journal, prepares, activates and retires roots
// and JWT keys, follows a plug-in directory or an upstream, and publishes
// each state it settles on as an immutable signing snapshot; a signer
// (signer*.go) signs from the snapshot published last without taking a
// lock, and waits only while a change is being decided, so that no leaf
// outlives the RemoveAfter a retirement computes for its root (board).
//
// State lives under <data-dir>/ca: a JSON journal (state.json, the commit
// point, written atomically) and one key (0600) and certificate per root,
// and one key (0600, roots/jwt-<kid>.key.pem) per JWT key.
// A corrupt state directory is refused with ErrCorruptState and never
// overwritten. `trustbridge ca issue` and `ca rotate` share the directory
// with a running server through an advisory lock.
//
// Config.Backend replaces the directory with another store of the same
// state (ca/kubestore: a Kubernetes Secret), written with optimistic
// concurrency: a writer that lost the race (ErrConflict) reloads and
// decides again, never publishing its own version. With Config.Leader,
// several replicas share one Backend: only the leader bootstraps, rotates
// and writes; followers reload (Reload, or Recheck from a watch), serve the
// same bundle and sign with the same active root. A follower with no
// state yet is not Ready and refuses to sign.
//
//	a, err := ca.New(ca.Config{TrustDomain: td, DataDir: "./data"})
//	if err != nil {
//		return err
//	}
//	go a.Run(ctx) // rotation on schedule
//	csr, err := ca.ParseCSR(pemOrDER) // at the edge: its signature and key checked
//	issued, err := a.SignX509SVID(ca.X509SVIDParams{PublicKey: csr.PublicKey, SPIFFEID: provenID}) // the ID comes from authentication, never from the CSR
//	token, exp, err := a.SignJWT(provenID, []string{"db"}, 0)
//
// Specs: X509-SVID §4 (signing certificates) and §5 (leaf certificates),
// JWT-SVID §2.2 (key ID) and §6.1 (publishing bundle elements), SPIFFE
// Federation §4.1 (adding and removing keys).
// https://github.com/spiffe/spiffe/blob/main/standards/X509-SVID.md
// https://github.com/spiffe/spiffe/blob/main/standards/JWT-SVID.md
// https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE_Federation.md#41-adding-and-removing-keys
package ca
