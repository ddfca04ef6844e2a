// Package server is trustbridge server as a package: one trust domain's
// embedded CA with root rotation, its federation with other trust domains,
// the bundle endpoint, the certificate and SDS services and the admin
// listener, composed from a Config.
//
// cmd/trustbridge turns flags, environment variables and the --config file
// into a Config (Config.AddFlags, Config.Load) and runs it:
//
//	var cfg server.Config
//	cfg.AddFlags(fs)
//	// fs.Parse(args)
//	if err := cfg.Load(fs, os.Getenv); err != nil {
//		return err
//	}
//	cfg.Stdout, cfg.Stderr = os.Stdout, os.Stderr
//	return server.New(cfg).Run(ctx)
//
// runServer builds the parts in order (the data directory's lock, the
// Kubernetes tier, the key manager, the CA, HA, the audit trail, the
// federation, the trust policy, the listeners), one setupX or newX each,
// then runs them all until the context is done. The server's own features
// live beneath it: admin, api, audit, statusui, backup, ha, hostcheck,
// nodeauth and connlimit.
package server
