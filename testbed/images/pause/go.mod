module sunk.test/pause

go 1.22
