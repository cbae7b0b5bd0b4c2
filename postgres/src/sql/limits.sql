-- Every limit of the layer $1, as stored (decoded by the backend).
SELECT scope, value FROM {limits} WHERE layer = $1
