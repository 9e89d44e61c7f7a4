package bus

// BucketPorts holds the public URLs of sandbox ports (issue 16, item 6):
// "t/<sha256 of the URL's secret>" -> the port and its project, and
// "s/<sandbox>/<port>" -> the same record, to revoke and list by sandbox.
const BucketPorts = "warren-ports"
