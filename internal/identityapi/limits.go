package identityapi

// Bounds of the identity service's requests, which the server enforces
// and clients keep to (a batching client cuts its calls by them, so that
// one workload's oversized request is refused alone).
const (
	// MaxAudiences is the most audiences one JWT-SVID may name.
	MaxAudiences = 16
	// MaxAudienceBytes bounds one audience value.
	MaxAudienceBytes = 512
	// MaxMintRequestBytes bounds a MintJWTSVIDRequest, alone or as an
	// item of a batch: the audiences at their limit, and framing.
	MaxMintRequestBytes = MaxAudiences*(MaxAudienceBytes+8) + 64
	// MaxMintBatch is the most items one MintJWTSVIDs call may hold.
	MaxMintBatch = 64
	// MaxMintBatchBytes bounds a MintJWTSVIDsRequest.
	MaxMintBatchBytes = 64 << 10
)
