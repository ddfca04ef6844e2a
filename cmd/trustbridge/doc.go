// Command trustbridge is trustbridge's command line: it turns flags,
// environment variables and the --config file into a server.Config and
// runs internal/server (trustbridge server), runs the node agent
// (trustbridge agent), and adds the command groups of cli/* (federation,
// bundle, ca, audit, policy, jwt, backup, config, token).
//
//	trustbridge version
//	trustbridge bundle inspect [--trust-domain TD] [--format table|json|pem|spiffe] FILE
//	trustbridge server --trust-domain TD [...]          CA, bundle endpoint, federation, gRPC CA + SDS
//	trustbridge ca issue|rotate|request [...]
//	trustbridge bundle show [-o spiffe|pem|...] | set TD FILE
//	trustbridge federation status|refresh|list|add|remove [...]
//	trustbridge agent [--ca-addr ADDR --root-cert FILE --token-file FILE] [--sds-socket PATH]
//
// `bundle inspect` applies exactly the rules trustbridge applies to fetched
// bundles (package internal/bundledoc) and exits 1 with the reason on
// stderr when a document would be refused.
package main
