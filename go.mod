module github.com/fptps/fpt

go 1.26.0

require (
	github.com/zeromq/goczmq v4.1.0+incompatible
	golang.org/x/sys v0.49.0
)
