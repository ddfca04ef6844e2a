// Package jwtsvid mints and validates JWT-SVIDs: the one place trustbridge
// signs a token (go-jose, through a crypto.Signer so the key may live in
// an HSM) and the one place it checks one (go-spiffe's
// jwtsvid.ParseAndValidate, behind a size limit and a required audience).
//
//	tok, err := jwtsvid.Mint(key, kid, jwtsvid.Claims{
//		Subject: id, Audience: []string{"https://api.example"},
//		IssuedAt: now, Expiry: now.Add(5 * time.Minute),
//	})
//	svid, err := jwtsvid.Validate(tok, bundles, []string{"https://api.example"})
//
// Validation looks the key up in the bundle of the subject's own trust
// domain only, by the kid header; it refuses alg "none", HMAC and every
// other symmetric algorithm, a typ other than JWT or JOSE, an unknown kid,
// expired and not-yet-valid tokens (one minute of leeway) and tokens for
// another audience.
//
// Spec: JWT-SVID §2 (JOSE header: alg, kid, typ), §3 (claims: sub, aud,
// exp), §4 (token signing and validation).
// https://github.com/spiffe/spiffe/blob/main/standards/JWT-SVID.md
package jwtsvid
