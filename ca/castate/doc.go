// Package castate is the persisted state of a ca.Authority and its codec:
// the journal (which roots, intermediates and JWT keys exist, in which
// state, and the published bundle's sequence), the material each record
// names, and how both are encoded into named blobs (state.json,
// <id>.crt.pem, <id>.key.pem, jwt-<kid>.key.pem) and checked when read
// back. A Backend keeps them: the file store of package ca in --data-dir,
// or ca/kubestore in a Kubernetes Secret; both use this codec, so a state
// moves between them unchanged.
//
// Decoding never trusts what it reads: every refusal wraps
// ErrCorruptState and never quotes a private key.
//
//	j, err := castate.DecodeJournal(data[castate.JournalKey], "example.org")
//	for _, rec := range j.Roots {
//		r, err := castate.DecodeRoot(rec, data[castate.RootCertKey(rec.ID)], data[castate.RootKeyKey(rec.ID)])
//		...
//	}
package castate
