// A hook that answers an error status, as a webhook would.
module.exports = async function (context) {
  return { status: 500, body: `no quota for ${context.request.body.parent.metadata.name}` };
};
