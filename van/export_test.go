package van

// Reasons for closing a connection, for the tests of package van_test.
var (
	ErrProtocol = errProtocol
	ErrStalled  = errStalled
)

// ChannelOf is channelOf, for the tests of package van_test.
var ChannelOf = channelOf
