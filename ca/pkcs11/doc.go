// Package pkcs11 keeps the CA's signing keys in a PKCS#11 token (an HSM,
// a cloud HSM's PKCS#11 library, or SoftHSM2 for tests) and implements
// ca.KeyManager on github.com/ThalesGroup/crypto11.
//
// Keys are generated inside the token (CKA_SENSITIVE, not extractable)
// and never leave it; each gets a random 16-byte CKA_ID and the label the
// CA gives it. The reference the journal stores, "pkcs11:id=<32 hex
// digits>", is not secret: state files and backups hold only references,
// and a key is usable only by a process logged in to the token.
//
//	pin, err := pkcs11.ReadPIN(pinFile, os.Getenv) // --pkcs11-pin-file, else TRUSTBRIDGE_PKCS11_PIN
//	if err != nil { ... }
//	keys, err := pkcs11.New(pkcs11.Config{
//		Module:     "/usr/lib/softhsm/libsofthsm2.so",
//		TokenLabel: "trustbridge",
//		PIN:        pin,
//		Logger:     logger,
//	})
//	if err != nil { ... } // names a missing module, an unknown token or a refused PIN
//	defer keys.Close()
//	cfg.Keys = keys // ca.Config
//
// crypto11 takes no context: CreateKey, FindKey and DestroyKey check
// ctx.Err() before each call into the token, but a call under way (an RSA
// 4096 generation takes seconds) is not interrupted.
//
// PKCS#11 modules are C libraries loaded at run time, so this package
// needs cgo. In a CGO_ENABLED=0 build (make build) New returns an error
// saying to build with make build-pkcs11. See docs/key-managers.md.
package pkcs11
