// Package flagenv lets environment variables set command-line flags: a
// flag declares the variables that set it (Bind), and Apply sets every
// flag not given on the command line from the first set one, so a flag
// beats its variable, which beats the default. One mechanism for every
// command: trustbridge server's TRUST_DOMAIN and the agent's Istio names
// alike, listed by docs/configuration.md from the declarations (Vars).
// Levenshtein is the edit distance the did-you-mean of commands, flags and
// config keys uses.
//
//	fs.StringVar(&o.TrustDomain, "trust-domain", "", "trust domain to serve")
//	flagenv.Bind(fs, "trust-domain", "TRUST_DOMAIN")
//	from, err := flagenv.Apply(fs, os.Getenv)
package flagenv
